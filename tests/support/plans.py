"""What the plan tests look for in a PostgreSQL ``EXPLAIN``."""

SORT_NODE = "Sort  ("
"""A sort node of a plan (a Merge Append of the partitions' ordered index scans, revision
0021, names its ``Sort Key`` and sorts nothing)."""
