"""`make fuzz` (issue 18): (a) VTS-style model mutation, (b) request mutation, (c) byte-level
.tflite mutation through the delegate, against real `nnhal serve` processes. Entry point:
``python -m tests.fuzz`` (__main__.py); test_fuzz_slice.py is the short slice `make test` runs."""
