-- _admission.lua: not a script. Pasted by scripts.py where a script says
-- '-- @include _admission': the fixed-window admission counters push.lua and admit.lua
-- share. A counter key holds the number of admitted pushes in its window; its TTL is
-- the time left in the window (set on the first hit), so no clock is read here.

-- Checks counters KEYS[first .. first+n-1] against limits ARGV[arg], ARGV[arg+2], ...
-- (window ms at ARGV[arg+1], ...). Returns 0 when every counter has room, else the
-- longest wait in ms until the counters that are full reset (at least 1).
local function admission_wait_ms(first, n, arg)
  local wait = 0
  for i = 0, n - 1 do
    local key = KEYS[first + i]
    local count = tonumber(redis.call('GET', key) or '0')
    if count + 1 > tonumber(ARGV[arg + 2 * i]) then
      local left = redis.call('PTTL', key)
      if left < 1 then  -- no TTL (cannot happen through these scripts): a full window
        left = tonumber(ARGV[arg + 2 * i + 1])
      end
      if left > wait then
        wait = left
      end
    end
  end
  return wait
end

-- Counts one admitted push on each counter; the first hit of a window starts its TTL.
local function admission_count(first, n, arg)
  for i = 0, n - 1 do
    local key = KEYS[first + i]
    if redis.call('INCR', key) == 1 then
      redis.call('PEXPIRE', key, tonumber(ARGV[arg + 2 * i + 1]))
    end
  end
end
