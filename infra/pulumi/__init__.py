"""The Pulumi driver shared by the backends that provision with Pulumi (aws, gcp): not a backend.

engine (the Automation API driver: stacks, up/refresh/destroy, locks), cli (the Pulumi CLI: where it
comes from, its version, where its state lives), state (shared team state and its secrets), events
(the bridge from the engine's events to ledger rows and progress, and its error text), provider (the
`Provider` a Pulumi backend reuses: `PulumiProvider(PLUGIN)`).

Nothing here names a cloud; `pulumi` itself is imported lazily, inside the functions that need it.
"""
