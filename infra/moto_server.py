"""moto's server, applying one request at a time.

DynamoDB applies each request to an item atomically: of two conditional writes racing on one item, one sees the
other's result. moto's threaded server runs requests side by side without that guarantee, so two racing
`UpdateItem`s can both pass their condition. This runs the same moto application behind one lock: connections stay
concurrent (the tests' races are real), each request is applied whole, as DynamoDB does.

Usage: python moto_server.py HOST PORT
"""

import sys
import threading

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def one_at_a_time(environ, start_response):
        with lock:
            # Consume the response inside the lock, so the whole request is applied before the next one starts.
            return list(app(environ, start_response))

    run_simple(host, port, one_at_a_time, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
