"""The ledger: the one SQLite file (`store`), its schema and migrations (`schema`), the typed records
read from it (`records`, `chains`, `attempts`), what a run writes into it once its row exists
(`recording`, `node_output`), the live progress read back from it (`progress`) and whether a
recorded run trained (`trained`).

Package order (tests/test_package_order.py): `node` < the top-level modules < `catalog` < `ledger` <
`costing` < `watch` < `plan` < `lifecycle` < `sweep`; a module imports only from its own level and below."""
