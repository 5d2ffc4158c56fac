"""torch.distributed.device_mesh's names, so that its import changes as the package's does:

    from mpicoll.dist.device_mesh import init_device_mesh   # torch.distributed.device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
"""

from . import DeviceMesh, init_device_mesh

__all__ = ["DeviceMesh", "init_device_mesh"]
