"""Where images come from: the datasets behind `data.name` (CIFAR, image folders and archives, synthetic images,
Hugging Face datasets, tar shards), each as train and val splits of (PIL image, class index) pairs."""
