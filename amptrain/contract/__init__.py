"""What every process agrees on, torch-free: the job spec (``spec``) and its limits, the
catalog of components (``catalog``, ``builtins``, ``registration``), the metric table
(``metrics``) and the record (``records``) and stream (``stream``) formats, the one
``Cursor``, errors, sizing and admission, data access rules and the checkpoint layout.
Imports pydantic, yaml and the standard library only."""
