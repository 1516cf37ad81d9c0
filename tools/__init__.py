"""The ops scripts that are not the server (tools/README.md): run from a checkout; app/ never imports them."""
