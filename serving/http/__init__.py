"""The HTTP child of a launch: the ASGI app, its routes, limits and metrics, and the client of
the schedulers' request sockets."""
