"""xrun runtime: the elastic agent and rendezvous that run inside every replica (torch-free)."""
