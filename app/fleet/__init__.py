"""Several replicas: the state's routing key, the process harness, the supervisor behind HAProxy."""
