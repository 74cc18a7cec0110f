"""matrixctl: inspect, verify, convert and build the binary files ML pipelines pass around.

The package is a library with a thin command line on top (`matrixctl.cli`). Importing the
package is cheap: numpy and the other heavy modules are imported by the code that needs them.
"""

__version__ = "0.1.0"
