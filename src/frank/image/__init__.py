"""Image building: deterministic OCI layouts without a daemon, engine builds, registry push.

The default builder writes an OCI image layout directly (tar layers, config, manifest) so the
same lock gives the same manifest digest on any machine; container engines are only used when
a part needs commands run inside the image.
"""
