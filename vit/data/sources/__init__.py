"""Where images come from: the datasets behind `data.name` (CIFAR, image folders and archives, synthetic images,
Hugging Face datasets), each as train and val splits of (PIL image, class index) pairs; tar shards (shards.py) are
streamed instead, by vit/data/loading/stream.py."""
