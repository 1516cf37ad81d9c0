"""The HTTP edge: routes, auth, request bodies, observability, the OpenAPI document, the page."""
