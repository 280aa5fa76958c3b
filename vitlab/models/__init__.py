"""One file per paper. Each defines ``CONFIGS`` (name -> config), ``MODEL`` (the class
built from a config) and, where a reference implementation exists, ``convert_timm`` /
``convert_hf`` (reference state dict -> vitlab state dict). ``vitlab.registry`` finds
them all. A model file never imports another, except ``deit.py``: DeiT's config and model
are ViT's (``vit.py``)."""
