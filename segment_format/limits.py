"""Integer limits of the format's fixed-width fields: offsets and timestamps are int64, relative
offsets, positions and lengths int32 (record.py's header, the index entries)."""

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
