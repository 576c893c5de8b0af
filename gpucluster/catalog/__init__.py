"""Instance and price data, dated and sourced, shipped with the package.

One module per cloud (`aws`, `gcp`) holds the instance facts and its `validate_spec(spec)`;
`prices` holds the price catalog. Data files live in `data/`. No cloud SDK is imported here.
"""
