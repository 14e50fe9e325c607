"""python3 -m dfa.gen_proto [--force]: generates the gRPC stubs (see dfa/_proto.py)."""

import sys

from dfa import _proto


def main(argv):
    _proto.generate(force="--force" in argv)
    _proto.load()
    print("dfa: gRPC stubs ready in %s/dfa/v1" % _proto._OUT_ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
