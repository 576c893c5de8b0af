"""The cost engine, one module per job; `gpucluster.costing.cost` is its public face (and documents the
billing rules and the resource records it prices).

rules     billing arithmetic: billed seconds, time and disk costs, money formatting
plan      a spec -> the priced plan and the launch-time price snapshot; the snapshot pricer
runcost   a run's true cost from its ledger resources
internal  the internal price of a run on machines gpucluster does not rent (option pricePerGpuHour)
estimate  the cost of a spec for some hours (costing the resources such a run records)
whatif    projections of time and cost from measured runs
report    per-run cost reports (table, JSON, CSV, PNG)

Everything particular to a cloud (how its nodes are priced, what a run of it records, its
defaults) is its plugin's `Pricing` part (see `infra.contract`); nothing here compares a
cloud's name. The plugin is an argument: `backend=` (the spec's or run's cloud) or `backends=`
(by name, for runs of any cloud), from the caller; nothing here asks the registry.
"""
