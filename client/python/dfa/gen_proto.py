"""python3 -m dfa.gen_proto [--force]: generates the gRPC stubs (see dfa/_proto.py)."""

import sys

from dfa import _proto


def main(argv):
    ran = _proto.generate(force="--force" in argv)
    _proto.load()
    print("dfa: gRPC stubs %s in %s/dfa/v1" % ("generated" if ran else "up to date", _proto._OUT_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
