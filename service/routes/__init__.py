"""The service's routes, one router per concern; ``service.app.create_app`` mounts them."""
