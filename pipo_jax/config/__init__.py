"""The run config's schema, on the ground floor: it imports no learner module.

    schema.py    the machinery: a key declared once (`key(default, doc, check, choices=)`), a `Section`,
                 defaults / from_config / to_config / describe, one-line `ConfigError`s
    registry.py  what the learner's registries push in: their names (a key's registered choices) and
                 their settings sections (a method's or task's own keys, declared beside its code)
    moves.py     keys a release moved or removed (RENAMED, RETIRED), as data
    sections.py  the run-level sections and `RunConfig`, the whole config
"""
