"""Input schemas, one module per concept: ``parameters`` (the seed's ``parameters`` map and
JSON Schema 2020-12, both ways), ``saving`` (what a schema must be to be saved),
``references`` (where ``$ref`` leads, loops and fan-out), ``budget`` (the bounds of one
check: steps, time, the patterns' searcher) and ``validation`` (a value against a schema)."""
