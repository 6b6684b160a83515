from django.urls import path

from proxies.consumers import TerminalRelayConsumer, VncRelayConsumer

websocket_urlpatterns = [
    path("ws/desktops/<str:desktop_id>/vnc", VncRelayConsumer.as_asgi()),
    path("ws/desktops/<str:desktop_id>/terminal", TerminalRelayConsumer.as_asgi()),
]
