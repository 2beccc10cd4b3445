"""tfplaceto: learned device placement for TensorFlow graphs (the Placeto method)."""

import setuptools

# The stack measured to install and import together on Python 3.11 (see README).
INSTALL_REQUIRES = [
    "tensorflow==2.15.1",
    "tf-agents==0.19.0",
    "dm-sonnet==2.0.2",
    "graph-nets==1.1.0",
    "dm-reverb==0.14.0",
    "numpy>=1.26,<2",
    "protobuf>=4.25,<4.26",  # what TF 2.15 pins; the generated protos target it
    "scipy>=1.11",  # HiGHS for the m-SCT LP relaxation
    "pymetis>=2023.1",
    "numba>=0.59",  # the simulator's hot loop
    "matplotlib>=3.8",
    "tqdm>=4.66",
    "gin-config>=0.5",
    "portpicker>=1.6",  # free ports for LocalTFCluster workers
]

TEST_REQUIRES = [
    "pytest>=8",
    "hypothesis>=6.100",
    "ruff>=0.5",
    "grpcio-tools==1.62.3",  # generates code for protobuf 4.25
    "nbclient>=0.10",
    "nbformat>=5.10",
    "ipykernel>=6.29",
    "ipython>=8.12,<8.19",  # newer IPython needs a typing-extensions newer than tf-agents' pin
]

setuptools.setup(
    name="tfplaceto",
    version="0.1.0",
    description="Learned, generalizing device placement for TensorFlow graphs (Placeto).",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11,<3.12",
    packages=setuptools.find_packages(include=["tfplaceto", "tfplaceto.*"]),
    package_data={"tfplaceto": ["policy/*.gin", "policy/pretrained/*", "policy/pretrained/saved_policy/*",
                              "policy/pretrained/saved_policy/variables/*", "protos/*.proto"]},
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": TEST_REQUIRES},
    entry_points={"console_scripts": ["tfplaceto = tfplaceto.cli:main"]},
)
