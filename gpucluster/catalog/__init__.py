"""The price catalog, dated and sourced, shipped with the package.

`prices` loads the shipped rows (`data/prices.json`), overlays the user's refreshed rows and
writes them; each backend's instance facts and live price fetcher live in its own package
(`infra/<cloud>/catalog.py`, `infra/<cloud>/prices.py`). No cloud SDK is imported here.
"""
