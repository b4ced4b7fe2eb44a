"""The torchelastic worker env contract that the test workers report: one list for all of them
(behave.py, env_dump.py, launch_fns.py; each imports it from beside itself)."""

KEYS = (
    "LOCAL_RANK RANK GROUP_RANK ROLE_RANK ROLE_NAME LOCAL_WORLD_SIZE WORLD_SIZE GROUP_WORLD_SIZE "
    "ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS "
    "TORCHELASTIC_RUN_ID TORCHELASTIC_USE_AGENT_STORE TORCH_NCCL_ASYNC_ERROR_HANDLING "
    "TORCHELASTIC_ERROR_FILE OMP_NUM_THREADS"
).split()
