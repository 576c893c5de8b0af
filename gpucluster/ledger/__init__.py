"""The ledger: the one SQLite file (`store`), its schema and migrations (`schema`), the typed records
read from it (`records`, `chains`, `attempts`), what a run writes into it once its row exists
(`recording`, `node_output`) and the live progress read back from it (`progress`).

Package order (tests/test_layout.py): the top-level modules and `node` < `catalog` < `ledger` <
`costing` < `watch` < `plan` < `lifecycle` < `sweep`; a package imports only from its own level and below."""
