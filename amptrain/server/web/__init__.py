"""The HTTP side of the API process: the FastAPI app, its dependencies (one session per
request, one commit owner), auth, the error hierarchy and its one handler, response
schemas, the routes (one module per resource) and the dashboard's static files."""
