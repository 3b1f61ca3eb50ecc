"""/docs and /redoc send a Content-Security-Policy that keeps them to the service's own
origin, with their inline scripts allowed by hash only (the browser test that they still
render: tests/server/web/dashboard/test_docs_pages.py)."""

from __future__ import annotations

import re

from amptrain.server.web.docs_csp import policy_for
from tests.support.stack import Stack


def directives(policy: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in policy.split("; ")}


def test_the_documentation_pages_send_a_policy_of_their_own_origin(api_stack: Stack) -> None:
    c = api_stack.client
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        response = c.get(path)
        assert response.status_code == 200, path
        policy = directives(response.headers["Content-Security-Policy"])
        assert policy["default-src"] == ["'self'"]
        assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
        assert "'unsafe-inline'" not in policy["script-src"], path
        assert "'unsafe-eval'" not in policy["script-src"], path
        inline = re.findall(r"<script>(.*?)</script>", response.text, re.DOTALL)
        assert len(policy["script-src"]) == 1 + len(inline), path  # 'self' and one hash each
        assert response.headers["Content-Security-Policy"] == policy_for(response.content)
        # Every script and style the page loads comes from the service itself.
        for asset in re.findall(r'(?:src|href)="([^"]+)"', response.text):
            assert asset.startswith("/docs/assets/"), asset
            assert c.get(asset).status_code == 200, asset
    assert len(directives(c.get("/docs").headers["Content-Security-Policy"])["script-src"]) == 2
    # Other answers keep their own headers: no policy meant for the docs.
    assert "Content-Security-Policy" not in c.get("/healthz").headers
