"""Build hook: generates the gRPC stubs (dfa/v1/*_pb2*.py) into the build tree from the
repository's proto/ folder, so an installed `dfa` needs neither grpcio-tools nor the protos."""

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py

_HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        spec = importlib.util.spec_from_file_location("_dfa_proto", os.path.join(_HERE, "dfa", "_proto.py"))
        proto = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(proto)
        src = os.environ.get("DFA_PROTO_DIR") or os.path.normpath(os.path.join(_HERE, "..", "..", "proto"))
        proto.generate(out_root=self.build_lib, src_dir=src, force=True)


setup(cmdclass={"build_py": BuildWithStubs})
