"""doctor, an image in the store (`doctor REF`): found as `run` finds a
cached image (the same lookup in the own store, then the site store; never
a pull), held as `run` holds it (rmi and prune leave it alone meanwhile),
its config read from the run record (else the config blob) and its platform
checked; the tree checked is the image's rootfs, and the environment the
image's Env, which is what `run` puts in row 3 of the table."""
import os


def is_store_ref(text):
    """IMAGE names an image reference rather than a path (run's rule)."""
    from gpusandbox.cli import is_image_ref
    return is_image_ref(text)


def resolve(text, store=None):
    """(rootfs path, env dict, shown name) of the cached image `text`;
    ImageError when it is not in the store (with the hint to pull it)."""
    from gpusandbox.image import ref as refmod, runimage, runrec
    from gpusandbox.image.digest import ImageError
    from gpusandbox.imageroot import image_root
    ref = refmod.parse(text) if refmod.looks_like_transport(text) \
        else runimage._store_name(text)
    all_stores = runimage.stores(store)
    # Any transport by the name a pull records (oci:DIR:TAG as well), so an
    # imported layout or archive is found too; nothing is read from it.
    hit = runimage.find(ref, all_stores)
    if hit is None:
        src = f"docker://{ref.canonical()}" if ref.transport in ("store", "docker") \
            else ref.canonical()
        raise ImageError(f"image not in the store: {ref.canonical()}",
                         f"doctor does not pull (store {all_stores.root})",
                         f"pull it first: gpusandbox pull {src}")
    st, dig = hit
    st.hold(dig)        # held until doctor exits, as run holds it
    st.sealed(dig)      # a shared store's unsealed tree is refused, as by run
    conf = runimage._run_config(st, dig)
    runrec.check_platform(conf, runrec.host_platform(), False)
    # The rootfs as the launcher opens a bundle (config.json + rootfs/).
    root, rootfd, _config = image_root(st.bundle(dig))
    os.close(rootfd)
    return root, dict(conf.env), f"{ref.canonical()} ({dig[:19]})"
