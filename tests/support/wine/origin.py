"""A minimal local HTTPS origin for the command-line scenario of
scripts/wine-test.sh: serves the files of a folder over TLS on 127.0.0.1,
prints its port on the first line of stdout, and logs each request on
stderr.

    python3 origin.py DIR CERT.pem KEY.pem
"""

import functools
import http.server
import ssl
import sys


class Handler(http.server.SimpleHTTPRequestHandler):
    """Serves DIR; says each request in one short line."""

    def log_message(self, format, *args):
        sys.stderr.write("origin: " + (format % args) + "\n")


def main():
    folder, cert, key = sys.argv[1:4]
    handler = functools.partial(Handler, directory=folder)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
