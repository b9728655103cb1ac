"""visc's model names as timm 0.9.16 models, for the dev tools.

visc's ImageNet transformers carry timm's own names; its small-image
variants (28-32 px data) are timm's classes with other hyperparameters.
timm_model(name, ...) builds the timm model visc's `name` mirrors, so a
visc checkpoint loads into it with strict=True and the two compute the same
logits. Used by bench/torch_train.py and tools/check_torch_load.py (the
golden generators keep their own copies so they stay self-contained)."""

# name -> (timm model to start from, constructor overrides)
VARIANTS = {
    "vit_tiny_patch4_32": ("vit_tiny_patch16_224", dict(patch_size=4, img_size=32)),
    "deit_tiny_patch4_32": ("deit_tiny_patch16_224", dict(patch_size=4, img_size=32)),
    "vit_small_patch4_32": ("vit_small_patch16_224", dict(patch_size=4, img_size=32)),
    "vit_femto_patch4_28": ("vit_tiny_patch16_224",
                            dict(patch_size=4, img_size=28, embed_dim=64, depth=4, num_heads=2)),
    "vit_pico_patch4_28": ("vit_tiny_patch16_224",
                           dict(patch_size=4, img_size=28, embed_dim=96, depth=6, num_heads=3)),
    "swin_tiny_patch2_window4_32": ("swin_tiny_patch4_window7_224",
                                    dict(patch_size=2, window_size=4, img_size=32)),
    "swinv2_tiny_patch2_window4_32": ("swinv2_tiny_window8_256",
                                      dict(patch_size=2, window_size=4, img_size=32)),
    "swin_micro_patch2_window4_32": ("swin_tiny_patch4_window7_224",
                                     dict(patch_size=2, window_size=4, img_size=32, embed_dim=32,
                                          depths=(2, 2, 2), num_heads=(2, 4, 8))),
    "swinv2_micro_patch2_window4_32": ("swinv2_tiny_window8_256",
                                       dict(patch_size=2, window_size=4, img_size=32,
                                            embed_dim=32, depths=(2, 2, 2), num_heads=(2, 4, 8))),
}


def is_timm_name(name):
    return name.startswith(("vit_", "deit_", "cait_", "swin"))


def timm_model(name, num_classes, in_chans=3, img_size=None):
    """The timm model visc's `name` mirrors (img_size None: the model's own)."""
    import timm
    base, kw = VARIANTS.get(name, (name, {}))
    kw = dict(kw)
    if img_size is not None:
        kw["img_size"] = img_size
    return timm.create_model(base, pretrained=False, num_classes=num_classes, in_chans=in_chans,
                             **kw)
