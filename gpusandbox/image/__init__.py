"""Images: references and transports (ref), the registry client (registry,
auth), the shared store (store), secure layer unpacking (unpack), local
archives and layouts (archive), image config -> RunSpec (config), and
squashfs image files (squash, squashfuse: run FILE.sqsh; sqshout: pull -o).

Nothing here is imported by `run` of a plain directory: the launch path
pays for an image module only when IMAGE is an image reference."""
