"""The augmentation: the `data.augment` keys checked (`AugmentSettings`), the policies behind
`data.augment.auto_augment`, and the stage both loaders run on uint8 batches on the device (`BatchAugment`)."""
