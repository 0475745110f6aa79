"""The trainers: the iteration loop, the update written once, the single-process and the Ray trainer, and the
Ray trainer's actors."""
