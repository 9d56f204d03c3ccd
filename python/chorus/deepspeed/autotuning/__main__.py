import sys

from chorus.deepspeed.autotuning.autotuner import main

sys.exit(main())
