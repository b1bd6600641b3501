"""After training: the weights a model is evaluated with (ours or foreign), its preprocessing, export to
ONNX / TorchScript / torch.export files, and running an exported ONNX file without the training code."""
