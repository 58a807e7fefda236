"""The gRPC wire contract, generated from proto/ (`python -m decentralized_verl.proto.generate`).

Import the generated modules explicitly (`from decentralized_verl.proto import dverl_pb2, dverl_pb2_grpc`);
this package imports nothing so the operator's import path stays light.
"""
