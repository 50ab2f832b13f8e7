"""Package discovery, the one thing pyproject.toml cannot say: the stage folders sit at the top
of the repository (see ARCHITECTURE.md) but install as sub-packages of `tritonkit`, so nothing
generic like `configs` lands in site-packages. Every top-level folder with an `__init__.py` is a
stage and is found here, so a new one cannot be left out of the wheel."""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
NOT_SHIPPED = {"tests", "build", "dist"}

package_dir = {"tritonkit": "tritonkit"}
package_dir |= {f"tritonkit.{d.name}": d.name for d in sorted(ROOT.iterdir())
                if (d / "__init__.py").is_file() and d.name not in NOT_SHIPPED | {"tritonkit"}}
packages = [name + sub for name, folder in package_dir.items()
            for sub in ["", *(f".{p}" for p in find_packages(ROOT / folder))]]

setup(packages=packages, package_dir=package_dir)
