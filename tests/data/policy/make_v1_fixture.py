import torch, os
torch.set_num_threads(1)
from backdrive.envs import Pendulum
from backdrive.optim._policy import train_policy
kw = dict(horizon=4, hidden=(8,), critic_iterations=1, critic_minibatches=1, critic_replay=1,
          action_noise=0.1, seed=5)
t = train_policy(Pendulum(2, max_episode_steps=16), "shac", updates=2, checkpoint="tests/data/policy/shac_v1.pt", **kw)
obs = Pendulum(3).reset(seed=4)
with torch.no_grad():
    act = t.policy(obs)
# reference: actions of the saved policy and the run continued to 4 updates
t2 = train_policy(Pendulum(2, max_episode_steps=16), "shac", updates=4, **kw)
torch.save({"obs": obs, "actions": act,
            "policy_after_4": {k: v.clone() for k, v in t2.policy.state_dict().items()}},
           "tests/data/policy/shac_v1_expected.pt")
print(os.path.getsize("tests/data/policy/shac_v1.pt"), os.path.getsize("tests/data/policy/shac_v1_expected.pt"))
ck = torch.load("tests/data/policy/shac_v1.pt", weights_only=True)
print(sorted(ck), ck["config"])
