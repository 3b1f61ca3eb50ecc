"""The client on users' machines (the ``client`` extra): ``http`` the Python client of the
HTTP and WebSocket API, ``commands`` the ``amptrain submit|watch|jobs|cancel|logs``
commands. Imports nothing of the server stack."""
