# Loaded by lab/serve (--config): every kernel the server starts is one the lab offers.
# KernelSpecManager.allowed_kernelspecs hides the others from the list, but a request by
# name (POST /api/kernels {"name": "python3"}, a notebook whose metadata names python3)
# would still start them, without the 8 emulated devices. Here such a request starts the
# lab's default kernel instead, and the server's log says so. (Refusing it is worse: after
# a kernel fails to start, jupyter_server 2 no longer shuts down while another one runs.)
from jupyter_client.kernelspec import KernelSpecManager


class OnlyTheLabsKernels(KernelSpecManager):
  default_kernel = "allreduce-jax"

  def get_kernel_spec(self, kernel_name):
    if self.allowed_kernelspecs and kernel_name not in self.allowed_kernelspecs:
      self.log.warning(
        "kernel %r is not one of the lab's (%s); starting %r instead",
        kernel_name,
        ", ".join(sorted(self.allowed_kernelspecs)),
        self.default_kernel,
      )
      kernel_name = self.default_kernel
    return super().get_kernel_spec(kernel_name)


c.ServerApp.kernel_spec_manager_class = OnlyTheLabsKernels  # noqa: F821 (the config object)
