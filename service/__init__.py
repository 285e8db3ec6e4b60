"""nnhal service: the gRPC driver process, its client library, shared memory and bursts."""

#: The device name this driver reports, as NNAPI lists devices (ANeuralNetworksDevice_getName):
#: what TFLite's ``accelerator_name`` selects. Here so the delegate can check it without hal.
DEVICE_NAME = "nnhal"
