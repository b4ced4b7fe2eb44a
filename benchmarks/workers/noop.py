"""The do-nothing worker: what a launcher costs when the job itself costs nothing."""
