"""The event plane's broker for a loopback Dynamo deployment (scripts/test-dynamo.sh): Dynamo's
ZMQ publishers bind 0.0.0.0 unless they connect to a broker, so frontend and workers are given
``DYN_ZMQ_BROKER_URL`` naming this XSUB / XPUB pair, bound to 127.0.0.1.

    python dynamo_zmq_proxy.py XSUB_PORT XPUB_PORT
"""

import sys

import zmq

if __name__ == "__main__":
    context = zmq.Context()
    xsub = context.socket(zmq.XSUB)
    xsub.bind(f"tcp://127.0.0.1:{int(sys.argv[1])}")
    xpub = context.socket(zmq.XPUB)
    xpub.bind(f"tcp://127.0.0.1:{int(sys.argv[2])}")
    print("ready", flush=True)
    zmq.proxy(xsub, xpub)
