"""The heartbeat launcher's parts: the elastic agent subclass, the heartbeat monitor and the zygote."""
