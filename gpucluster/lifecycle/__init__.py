"""A run's life, shared by every backend: the one prepare step (`prepare`), the run sequence itself
(`steps`: provision, launch, watch, collect, tear down and check), recovery and failover
(`recovery`, `failover`), kept clusters (`kept`, `held`), `down` and `gc` (`teardown`), who owns a
cluster and its resources (`owner`, `ownership`) and events for people (`notify`)."""
