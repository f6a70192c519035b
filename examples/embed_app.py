"""An application that embeds sglang-launch: start a server, use it, stop it.

    .venv/bin/python examples/embed_app.py [--port N]

``from launcher import Launcher`` is a lazy facade, so it is safe at module scope: every
``spawn`` child re-runs this module's top level, which must stay cheap. Everything else lives
under the ``__main__`` guard. A launch that fails raises ``LaunchError`` here, with the root
cause; this process is never killed, and no worker process outlives the ``with`` block.
"""

import argparse
import json
import urllib.request

from launcher import Launcher, LaunchError


def embed(url: str, text: str) -> list[float]:
    body = json.dumps({"input": text}).encode()
    request = urllib.request.Request(
        url + "/v1/embeddings", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["data"][0]["embedding"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=30000)
    opts = parser.parse_args()
    try:
        # The embedded sentence-embedding model, by its name (no model_path: the chat model).
        with Launcher(model_path="all-MiniLM-L6-v2", port=opts.port) as launcher:
            url = f"http://127.0.0.1:{opts.port}"
            workers = launcher.status()["workers"]
            print(f"ready at {url} with {len(workers)} workers")
            vector = embed(url, "a cat sits on the mat")
            print(
                f"embedding of 'a cat sits on the mat': {len(vector)} numbers, first {vector[0]:.4f}"
            )
    except LaunchError as exc:
        print(f"the server did not start:\n{exc}")
        return 1
    print("stopped; every worker is gone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
