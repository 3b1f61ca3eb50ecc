"""The ``amptrain`` command (every process starts here): ``main`` is the entry point with
lazy command groups (``--help`` imports nothing heavy), ``up`` the whole service on one
machine, ``server`` the API/recorder/database commands, ``tokens`` token management,
``train`` a spec trained locally without a server, ``embedded_redis`` the private
``redis-server`` that ``up`` and the tests start."""
