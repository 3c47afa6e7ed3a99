"""The transports: thin adapters from a wire (HTTP/SSE, GA WebSocket, the long-lived WebSocket) to the
sans-IO cores and the response driver."""
