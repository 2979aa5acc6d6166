"""The service's ASGI middlewares, one module each: a class taking ``(app, **options)``, its options
checked in ``__init__``. ``service/app.py:create_app`` stacks them in one list, outermost first:

request_id    RequestIdMiddleware: an id per request, returned in ``x-request-id``
observe       ObserveMiddleware: request metrics and the one JSON access-log line
error_shape   ErrorShapeMiddleware: errors in the shape of the wire format a path speaks
auth          AuthMiddleware: the bearer key → the request's caller (401 without one)
rate_limit    RateLimitMiddleware: a token bucket per caller (429), when configured
json_body     JsonBodyMiddleware: bodies must be JSON (415)
decompress    DecompressMiddleware: zstd/gzip bodies decoded within a size and a time limit

``asgi`` holds the ASGI shapes they share.
"""
