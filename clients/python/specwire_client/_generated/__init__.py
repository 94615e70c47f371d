"""Stubs generated from the repository's proto/ by setup.py at build time (not kept in git).

Module names mirror the descriptor file names the C++ server registers and its reflection
reports: proto/specwire/v1/extractor.proto -> proto.specwire.v1.extractor_pb2.
"""
