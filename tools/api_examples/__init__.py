"""docs/api.md's examples, made by the real server: the Starlette app on a tiny model with random weights,
asked each example's request in turn; each example's region of the page (between `<!-- api-example: NAME -->`
and `<!-- /api-example -->`) is the request as a curl command and what came back.

    .venv/bin/python -m tools.api_examples            # exits 1 and says which differ, where the page is stale
    .venv/bin/python -m tools.api_examples --write    # writes them into docs/api.md (make api-examples)

By what each part is about: `bodies` (the requests the examples send), `harness` (the servers they are
sent to, and the gate that catches a job part-way), `scenarios` (what each example asks, and which
region shows it; the server's folder is shown as /tmp/apidoc), `render` (a request as curl, a response
as the page lays it out), `page` (the regions of docs/api.md: which are stale, the page with new ones).
"""
