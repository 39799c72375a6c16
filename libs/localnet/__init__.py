"""Starting real local processes (redis-server, uvicorn services) on free loopback ports."""
